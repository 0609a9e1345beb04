"""The producer's flush before a commit waits for the records sent before it, however busy the
send buffer stays, and the send buffer's size is the bytes waiting in it (streamapp.kafka.producer)."""

from __future__ import annotations

import asyncio
import types

from streamapp.kafka.producer import ByteSendBuffer, SendBufferBytes, StreamappProducer


class Sent(asyncio.Future):
    """A record handed to the send buffer, resolved on the broker's ack (Faust's FutureMessage)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.message = types.SimpleNamespace(key=b"k", value=b"v" * (size - 1))


def _producer(buffer: SendBufferBytes):
    # The attributes StreamappProducer.flush reads; no Kafka producer behind it.
    return types.SimpleNamespace(buffer=types.SimpleNamespace(pending=buffer), _producer=None,
                                 _transaction_producers={})


def test_unsent_names_the_record_being_sent_and_those_waiting():
    async def scenario():
        buffer = SendBufferBytes()
        records = [Sent(10) for _ in range(3)]
        for record in records:
            buffer.put_nowait(record)
        taken = buffer.get_nowait()
        assert buffer.unsent() == records
        taken.set_result(None)
        assert buffer.unsent() == records[1:]

    asyncio.run(scenario())


def test_flush_returns_once_earlier_records_are_acked_while_new_ones_keep_coming():
    async def scenario():
        buffer = SendBufferBytes()
        before = [Sent(100) for _ in range(5)]
        for record in before:
            buffer.put_nowait(record)

        async def sender():  # acks each record a little after taking it; a new one arrives each time
            while True:
                record = await buffer.get()
                buffer.put_nowait(Sent(100))
                await asyncio.sleep(0.01)
                record.set_result(None)

        sending = asyncio.create_task(sender())
        try:
            await asyncio.wait_for(StreamappProducer.flush(_producer(buffer)), timeout=10)
            assert all(record.done() for record in before)
            assert not buffer.empty(), "records kept coming; the flush did not wait for them"
        finally:
            sending.cancel()

    asyncio.run(scenario())


def test_flush_waits_for_a_slow_ack():
    async def scenario():
        buffer = SendBufferBytes()
        slow = Sent(100)
        buffer.put_nowait(slow)
        buffer.get_nowait()
        asyncio.get_running_loop().call_later(0.3, slow.set_result, None)  # slower than Faust's 0.1 s
        await StreamappProducer.flush(_producer(buffer))
        assert slow.done()

    asyncio.run(scenario())


def test_the_send_buffer_size_is_its_bytes_against_the_byte_limit():
    async def scenario():
        buffer = ByteSendBuffer()
        buffer.pending = SendBufferBytes()
        buffer.limit_bytes(250)  # as the app sets it
        for _ in range(2):
            buffer.pending.put_nowait(Sent(100))
        assert buffer.size == 200 and not buffer.size > buffer.max_messages
        buffer.pending.put_nowait(Sent(100))
        assert buffer.size == 300 and buffer.size > buffer.max_messages  # Faust now waits before a record

    asyncio.run(scenario())
