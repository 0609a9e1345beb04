"""Record batches built and checked with the processor's CRC instruction.

aiokafka checksums (CRC-32C) every record batch it builds and checks every batch it fetches with a
table-driven C loop, and its C builder copies each value into the batch as it is appended. For
~50 KB frames the checksums were among the join worker's largest costs, and a process that
publishes and reads them pays them too (docs/benchmarks.md, "Checksums by the CPU's
instruction"). The ``crc32c`` package uses SSE 4.2 or ARMv8 CRC instructions, with a software
fallback.

* **Built batches** (:class:`LeanBatchBuilder`): an uncompressed batch keeps each record as its
  small fields and a reference to its value (or to the parts of a
  :class:`~streamapp.recordbatches.Pieces` value), and joins them once when it is built, instead of
  copying each value as it is appended; its checksum is
  computed over the batch in place, where aiokafka's copied the batch first. The bytes are those
  of aiokafka's builders; compressed batches are built by aiokafka's own Python builder.
* **Fetched batches** are still read by aiokafka's C reader; only the check of each v2 batch's
  checksum, where aiokafka asks for it (``check_crcs``), is done here, over the batch's bytes as
  fetched. Older message formats keep aiokafka's CRC-32 check.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Iterator
from typing import Any

import crc32c
from aiokafka.consumer import fetcher
from aiokafka.producer import message_accumulator
from aiokafka.record import default_records
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import encode_varint, size_of_varint

from streamapp.recordbatches import Pieces

# Every batch starts with its base offset (8 bytes) and the length of the rest (4 bytes); in
# format v2 then the leader epoch (4), the magic byte and the CRC-32C of everything after it.
_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_LENGTH_AT, LOG_OVERHEAD = 8, 12
_MAGIC_AT, _CRC_AT, CRC_FROM = 16, 17, 21


def batch_crc_ok(batch: memoryview) -> bool:
    """Whether a format-v2 batch's stored CRC-32C matches its bytes."""
    return crc32c.crc32c(batch[CRC_FROM:]) == int.from_bytes(batch[_CRC_AT:CRC_FROM], "big")


class CheckedBatch:
    """One fetched batch as aiokafka's C reader gives it, its checksum checked here."""

    __slots__ = ("_batch", "_bytes")

    def __init__(self, batch, raw: memoryview) -> None:
        self._batch, self._bytes = batch, raw

    def validate_crc(self) -> bool:
        if self._bytes[_MAGIC_AT] < 2:
            return self._batch.validate_crc()
        return batch_crc_ok(self._bytes)

    def __iter__(self):
        return iter(self._batch)

    def __next__(self):
        return next(self._batch)

    def __getattr__(self, name: str):
        return getattr(self._batch, name)


class CheckedMemoryRecords:
    """aiokafka's ``MemoryRecords`` over one partition's fetched records, following where each
    batch starts so that its checksum can be checked over its bytes."""

    def __init__(self, data: bytes) -> None:
        self._records = MemoryRecords(data)
        self._view = memoryview(data)
        self._next_at = 0

    def size_in_bytes(self) -> int:
        return self._records.size_in_bytes()

    def has_next(self) -> bool:
        return self._records.has_next()

    def next_batch(self) -> CheckedBatch | None:
        batch = self._records.next_batch()
        if batch is None:
            return None
        start = self._next_at
        self._next_at = start + LOG_OVERHEAD + _LENGTH.unpack_from(self._view, start + _LENGTH_AT)[0]
        return CheckedBatch(batch, self._view[start:self._next_at])


class LeanBatchBuilder(default_records._DefaultRecordBatchBuilderPy):
    """aiokafka's batch builder (the accumulator's ``DefaultRecordBatchBuilder``) for format v2:
    an uncompressed batch holds its records as pieces and joins them once in :meth:`build`."""

    _first_timestamp: int | None   # set by aiokafka's __init__
    _max_timestamp: int | None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pieces: list = []
        self._size = self.HEADER_STRUCT.size

    def append(self, offset, timestamp, key, value, headers):  # type: ignore[override]
        if self._compression_type:
            return super().append(offset, timestamp, key, bytes(value) if isinstance(value, Pieces) else value,
                                  headers)
        if timestamp is None:
            timestamp = int(time.time() * 1000)
        first: int | None = self._first_timestamp
        if first is None:
            self._first_timestamp = self._max_timestamp = timestamp
        fields = bytearray(b"\x00")  # attributes
        encode_varint(timestamp - (timestamp if first is None else first), fields.append)
        encode_varint(offset, fields.append)
        _append_bytes(fields, key)
        if value is None:
            parts: tuple = (b"",)
            fields.append(1)  # varint -1: null
        else:
            # Held until build: a bytearray could change before then; Pieces' parts cannot.
            parts = value.parts if isinstance(value, Pieces) else (bytes(value),)
            encode_varint(len(value), fields.append)
        trailer = bytearray()
        encode_varint(len(headers), trailer.append)
        for header_key, header_value in headers:
            _append_bytes(trailer, header_key.encode())
            _append_bytes(trailer, header_value)
        length = len(fields) + (len(value) if value is not None else 0) + len(trailer)
        required = size_of_varint(length) + length
        if self._size + required > self._batch_size and first is not None:
            return None
        prefix = bytearray()
        encode_varint(length, prefix.append)
        self._pieces += (prefix + fields, *parts, trailer)
        self._size += required
        self._max_timestamp = max(self._max_timestamp or timestamp, timestamp)
        self._num_records += 1
        self._last_offset = offset
        return default_records._DefaultRecordMetadataPy(offset, required, timestamp)

    def size(self) -> int:
        return self._size if not self._compression_type else super().size()

    def _write_header(self, use_compression_type: bool = True) -> None:
        """aiokafka's header, its checksum computed over the batch in place: aiokafka's slices the
        buffer first, a copy of the whole batch (up to a MiB) for each batch built."""
        self.HEADER_STRUCT.pack_into(
            self._buffer, 0, 0, len(self._buffer) - self.AFTER_LEN_OFFSET, self.NO_PARTITION_LEADER_EPOCH,
            self._magic, 0, self._get_attributes(use_compression_type), self._last_offset,
            self._first_timestamp or 0, self._max_timestamp or 0, self._producer_id, self._producer_epoch,
            self._base_sequence, self._num_records)
        with memoryview(self._buffer) as batch:
            crc = crc32c.crc32c(batch[self.ATTRIBUTES_OFFSET:])
        _CRC.pack_into(self._buffer, self.CRC_OFFSET, crc)

    def build(self) -> bytearray:
        if self._compression_type:
            return super().build()
        self._buffer = bytearray().join([bytes(self.HEADER_STRUCT.size), *self._pieces])
        self._pieces = []
        self._write_header()
        return self._buffer


def _append_bytes(out: bytearray, value: bytes | None) -> None:
    """A varint length and the bytes, or -1 for null."""
    if value is None:
        out.append(1)
    else:
        encode_varint(len(value), out.append)
        out += value


# What install() rebinds: (module, name, the value put there).
_REBOUND: tuple[tuple[Any, str, Any], ...] = (
    (default_records, "calc_crc32c", crc32c.crc32c),  # the Python builder's
    (message_accumulator, "DefaultRecordBatchBuilder", LeanBatchBuilder),
    (fetcher, "MemoryRecords", CheckedMemoryRecords),
)


def install() -> None:
    """Make every aiokafka producer and consumer in this process checksum so. Idempotent."""
    for module, name, value in _REBOUND:
        setattr(module, name, value)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """:func:`install` for the ``with`` block; after it, what each name held before is put back
    (installed already, it stays so). The process-wide rebinding kept out of other code's way."""
    before = [(module, name, getattr(module, name)) for module, name, _ in _REBOUND]
    install()
    try:
        yield
    finally:
        for module, name, value in before:
            setattr(module, name, value)
