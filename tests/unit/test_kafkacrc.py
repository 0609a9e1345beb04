"""Record batch checksums by the CPU's CRC instruction: built batches are byte for byte aiokafka's
C builder's, fetched batches read the same records and a changed byte is caught where aiokafka
would catch it."""

from __future__ import annotations

import asyncio
import os

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.consumer import fetcher
from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.errors import CorruptRecordException
from aiokafka.producer import message_accumulator
from aiokafka.record import default_records
from aiokafka.record._crecords import DefaultRecordBatchBuilder as CBuilder, LegacyRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from streamapp.kafka import crc as kafkacrc
from streamapp.kafka.crc import CheckedMemoryRecords, LeanBatchBuilder
from streamapp.recordbatches import Pieces

RECORDS = [(b"cam0:1:7", os.urandom(49_000), [("origin", b"join")]), (None, b"x" * 300, []),
           (b"k", None, [("a", None)]), (b"cam1:2:9", os.urandom(70_000), [])]


def build(builder_type, records=RECORDS, *, transactional=False, producer=(-1, -1, -1)) -> bytes:
    builder = builder_type(2, 0, int(transactional), *producer, 1 << 20)
    for offset, (key, value, headers) in enumerate(records):
        assert builder.append(offset, 1_700_000_000_000 + offset, key, value, headers) is not None
    return bytes(builder.build())


def blob(*batches: bytes) -> bytes:
    """Batches one after the other, as a fetch response holds a partition's records."""
    return b"".join(batches)


def records_of(records) -> list[tuple]:
    read = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        read += [(record.offset, record.timestamp, record.key, record.value, record.headers) for record in batch]
    return read


@pytest.fixture(autouse=True)
def installed():
    with kafkacrc.installed():
        yield


def test_installed_for_a_block_puts_back_what_was_there(monkeypatch):
    names = ((default_records, "calc_crc32c"), (message_accumulator, "DefaultRecordBatchBuilder"),
             (fetcher, "MemoryRecords"))
    before = {name: object() for _, name in names}  # what this process held, whatever it was
    for module, name in names:
        monkeypatch.setattr(module, name, before[name])
    with kafkacrc.installed():
        with kafkacrc.installed():  # installed already: it stays so
            pass
        assert (message_accumulator.DefaultRecordBatchBuilder, fetcher.MemoryRecords) == \
            (LeanBatchBuilder, CheckedMemoryRecords)
    assert {name: getattr(module, name) for module, name in names} == before


@pytest.mark.parametrize("transactional", [False, True])
@pytest.mark.parametrize("producer", [(-1, -1, -1), (4711, 3, 120)])
def test_built_batches_are_the_c_builders_bytes(transactional, producer):
    assert message_accumulator.DefaultRecordBatchBuilder is LeanBatchBuilder
    assert build(LeanBatchBuilder, transactional=transactional, producer=producer) == \
        build(CBuilder, transactional=transactional, producer=producer)


def test_a_full_batch_refuses_what_the_c_builder_refuses():
    lean, c = (builder_type(2, 0, 0, -1, -1, -1, 120_000) for builder_type in (LeanBatchBuilder, CBuilder))
    values = [os.urandom(49_000), os.urandom(49_000), os.urandom(30_000), b"x" * 10]
    taken = [(lean.append(offset, 1_700_000_000_000, b"k", value, []) is not None,
              c.append(offset, 1_700_000_000_000, b"k", value, []) is not None)
             for offset, value in enumerate(values[:3])]
    assert taken == [(True, True), (True, True), (False, False)]
    assert lean.size() == c.size()
    assert bytes(lean.build()) == bytes(c.build())


def test_a_record_larger_than_the_batch_still_goes_alone():
    lean = LeanBatchBuilder(2, 0, 0, -1, -1, -1, 1_000)
    assert lean.append(0, 1_700_000_000_000, None, os.urandom(5_000), []) is not None
    assert lean.append(1, 1_700_000_000_000, None, b"x", []) is None


def test_values_are_taken_as_they_were_when_appended():
    value = bytearray(b"frame" * 100)
    lean = LeanBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    lean.append(0, 1_700_000_000_000, b"k", value, [])
    value[:5] = b"XXXXX"
    c = CBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    c.append(0, 1_700_000_000_000, b"k", b"frame" * 100, [])
    assert bytes(lean.build()) == bytes(c.build())


@pytest.mark.parametrize("compression", [0, 1])
def test_a_value_in_pieces_is_the_joined_value(compression):
    head, body = os.urandom(300), bytes(os.urandom(49_000))
    lean = LeanBatchBuilder(2, compression, 0, -1, -1, -1, 1 << 20)
    assert lean.append(0, 1_700_000_000_000, b"k", Pieces(head, memoryview(body)[100:]), []) is not None
    joined = LeanBatchBuilder(2, compression, 0, -1, -1, -1, 1 << 20)
    joined.append(0, 1_700_000_000_000, b"k", head + body[100:], [])
    assert lean.size() == joined.size()
    assert records_of(MemoryRecords(bytes(lean.build()))) == records_of(MemoryRecords(bytes(joined.build())))


def test_compressed_batches_are_aiokafkas():
    gzip = 1
    lean = LeanBatchBuilder(2, gzip, 0, -1, -1, -1, 1 << 20)
    for offset, (key, value, headers) in enumerate(RECORDS):
        lean.append(offset, 1_700_000_000_000 + offset, key, value, headers)
    assert records_of(MemoryRecords(bytes(lean.build()))) == records_of(MemoryRecords(build(CBuilder)))


def test_fetched_batches_read_as_aiokafka_reads_them():
    data = blob(build(CBuilder), build(CBuilder, RECORDS[:1]), build(CBuilder, RECORDS[1:3]))
    assert records_of(CheckedMemoryRecords(data)) == records_of(MemoryRecords(data))
    assert CheckedMemoryRecords(data).size_in_bytes() == len(data)


def test_a_changed_byte_fails_that_batch_only():
    first, second = build(CBuilder), bytearray(build(CBuilder))
    second[len(second) // 2] ^= 0x01
    records = CheckedMemoryRecords(blob(first, bytes(second)))
    assert records.next_batch().validate_crc()
    assert not records.next_batch().validate_crc()
    assert not records.has_next()


def test_the_consumer_raises_at_the_corrupt_batch():
    good, bad = build(CBuilder, RECORDS[:2]), bytearray(build(CBuilder, RECORDS[2:]))
    bad[-5] ^= 0xFF
    partition = PartitionRecords(TopicPartition("frames", 0), CheckedMemoryRecords(blob(good, bytes(bad))),
                                 None, 0, None, None, True, "read_uncommitted")
    assert [next(partition).offset, next(partition).offset] == [0, 1]
    with pytest.raises(CorruptRecordException):
        next(partition)


def test_a_partial_last_batch_is_left_for_the_next_fetch():
    whole = build(CBuilder)
    records = CheckedMemoryRecords(blob(whole, whole[: len(whole) // 2]))
    assert records.next_batch().validate_crc()
    assert not records.has_next()


def test_old_message_formats_keep_aiokafkas_check():
    builder = LegacyRecordBatchBuilder(1, 0, 1 << 20)
    builder.append(0, 1_700_000_000_000, b"k", b"v" * 100)
    legacy = bytearray(builder.build())
    batch = CheckedMemoryRecords(bytes(legacy)).next_batch()
    assert batch.validate_crc()
    legacy[-1] ^= 0x01
    assert not CheckedMemoryRecords(bytes(legacy)).next_batch().validate_crc()


def test_aiokafkas_producer_builds_its_batches_here_after_a_second_install(monkeypatch):
    """Through aiokafka's own ``create_batch``: the producer's batch is built by LeanBatchBuilder
    (installing again changes nothing), and reads back as aiokafka's reader reads it."""
    kafkacrc.install()
    built = []
    build_lean = LeanBatchBuilder.build
    monkeypatch.setattr(LeanBatchBuilder, "build", lambda self: built.append(self) or build_lean(self))

    async def one_batch() -> bytes:
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9")  # never started: no broker needed
        batch = producer.create_batch()
        assert batch.append(timestamp=1_700_000_000_000, key=b"cam0:1:7", value=b"frame") is not None
        batch.close()
        return bytes(batch._build())

    data = asyncio.run(one_batch())
    assert len(built) == 1
    assert [(key, value) for _, _, key, value, _ in records_of(MemoryRecords(data))] == [(b"cam0:1:7", b"frame")]
