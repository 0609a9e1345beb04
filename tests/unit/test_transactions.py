"""A stage's partition transactions: a commit interval's batches commit once, per input partition,
the offsets past its last event of each topic; events of an older generation send nowhere and
commit nothing. (The real broker: tests/integration/test_exactly_once.py.)"""

import asyncio
from types import SimpleNamespace

from aiokafka import TopicPartition
from aiokafka.errors import ProducerFenced

from streamapp.kafka.transactions import STALE, PartitionTransactions, TransactionSender


class TransactionalProducer:
    """What a batch asks of aiokafka's transactional producer, recorded."""

    def __init__(self) -> None:
        self.calls: list = []

    async def send_offsets_to_transaction(self, offsets, group_id):
        self.calls.append(("offsets", dict(offsets), group_id))

    async def commit_transaction(self):
        self.calls.append(("commit",))

    async def begin_transaction(self):
        self.calls.append(("begin",))

    async def stop(self):
        self.calls.append(("stop",))


def _event(topic: str, partition: int, offset: int, generation: int = 3):
    message = SimpleNamespace(topic=topic, partition=partition, offset=offset, generation_id=generation)
    return SimpleNamespace(message=message)


def _transactions(partitions=(0, 1), generation=3, interval_s=0.0) -> PartitionTransactions:
    app = SimpleNamespace(conf=SimpleNamespace(id="app-join"))
    transactions = PartitionTransactions(app, "join", ["frames", "detections"],  # type: ignore[arg-type]
                                         interval_s=interval_s)
    transactions.producers = {number: TransactionalProducer() for number in partitions}  # type: ignore[misc]
    transactions.senders = {number: TransactionSender(producer)  # type: ignore[arg-type]
                            for number, producer in transactions.producers.items()}
    transactions.generation = generation
    return transactions


async def _batch(transactions: PartitionTransactions, events) -> None:
    async with transactions.batch(events):
        pass  # the outputs would go out here


def test_each_partition_commits_the_offsets_past_its_last_event_of_each_topic():
    transactions = _transactions()
    events = [_event("frames", 0, 10), _event("detections", 0, 4), _event("frames", 0, 11),
              _event("frames", 1, 7)]
    asyncio.run(_batch(transactions, events))

    assert transactions.producers[0].calls == [
        ("offsets", {TopicPartition("frames", 0): 12, TopicPartition("detections", 0): 5}, "app-join"),
        ("commit",), ("begin",)]
    assert transactions.producers[1].calls == [
        ("offsets", {TopicPartition("frames", 1): 8}, "app-join"), ("commit",), ("begin",)]
    assert transactions.commits == 2
    assert transactions.transactional_id(1) == "app-join-join-1"


def test_events_of_an_older_generation_send_nowhere_and_commit_nothing():
    transactions = _transactions(generation=4)
    stale = _event("frames", 0, 10, generation=3)

    assert transactions.sender(stale) is STALE
    assert transactions.sender(_event("frames", 0, 11, generation=4)) is transactions.senders[0]
    asyncio.run(_batch(transactions, [stale]))
    assert transactions.producers[0].calls == []
    assert asyncio.run(transactions.commit_partition(3, 0)) is False


def test_a_partition_not_assigned_here_sends_nowhere():
    transactions = _transactions(partitions=(0,))
    assert transactions.sender(_event("frames", 1, 5)) is STALE
    assert transactions.producer_in(3, 1) is None


def test_a_commit_the_broker_refuses_stops_the_worker():
    class Fenced(TransactionalProducer):
        async def commit_transaction(self):
            raise ProducerFenced()

    async def scenario():
        crashes: list = []

        async def crash(reason):
            crashes.append(reason)

        transactions = _transactions(partitions=(0,))
        transactions.app.crash = crash
        transactions.producers[0] = Fenced()  # type: ignore[assignment]
        try:
            await _batch(transactions, [_event("frames", 0, 3)])
        except ProducerFenced:
            return crashes, transactions.commits
        raise AssertionError("the failed commit was not raised")

    crashes, commits = asyncio.run(scenario())
    assert [type(reason) for reason in crashes] == [ProducerFenced] and commits == 0


def test_the_batches_of_one_interval_commit_once_with_the_offsets_past_the_last():
    async def scenario():
        transactions = _transactions(interval_s=60.0)
        await _batch(transactions, [_event("frames", 0, 10)])
        await _batch(transactions, [_event("frames", 0, 11), _event("detections", 0, 3)])
        before = list(transactions.producers[0].calls)
        await transactions.commit_all()
        return transactions, before

    transactions, before = asyncio.run(scenario())
    assert before == []
    assert transactions.producers[0].calls == [
        ("offsets", {TopicPartition("frames", 0): 12, TopicPartition("detections", 0): 4}, "app-join"),
        ("commit",), ("begin",)]
    assert transactions.producers[1].calls == [] and transactions.commits == 1


def test_an_open_transaction_commits_once_its_interval_passes_without_another_batch():
    async def scenario():
        transactions = _transactions(interval_s=0.05)
        await _batch(transactions, [_event("frames", 1, 7)])
        committed_at_once = transactions.commits
        await asyncio.sleep(0.2)
        return committed_at_once, transactions

    committed_at_once, transactions = asyncio.run(scenario())
    assert committed_at_once == 0
    assert transactions.producers[1].calls == [("offsets", {TopicPartition("frames", 1): 8}, "app-join"),
                                               ("commit",), ("begin",)]
    assert transactions.opened_at is None


def test_a_stop_aborts_the_open_transactions_and_forgets_what_they_held():
    async def scenario():
        transactions = _transactions(partitions=(0,), interval_s=60.0)
        producer = transactions.producers[0]
        aborted: list = []
        transactions.on_abort = lambda: aborted.append(True)
        await _batch(transactions, [_event("frames", 0, 10)])
        await transactions.stop()
        return transactions, aborted, producer

    transactions, aborted, producer = asyncio.run(scenario())
    assert producer.calls == [("stop",)]  # nothing committed
    assert aborted == [True] and transactions.open == {} and transactions.commits == 0
    assert transactions.producers == {}
