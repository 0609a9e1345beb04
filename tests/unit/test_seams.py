"""Each seam's check fails when its library moves under it: one test per seam replaces what that
seam depends on with a changed stand-in (as a new release would) and expects the one-line refusal
naming the library, its installed version and the seam. A worker refuses to start so, with its
own exit code."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable

import aiokafka.consumer.fetcher
import faust.stores.rocksdb
import faust.tables.manager
import faust.transport.conductor
import faust.transport.consumer
import faust.transport.drivers.aiokafka
import mode.utils.queues
import prometheus_client.metrics
import pytest
from aiokafka.conn import AIOKafkaConnection
from aiokafka.producer.producer import AIOKafkaProducer
from aiokafka.record import default_records
from faust.sensors.base import SensorDelegate
from faust.sensors.monitor import Monitor

from streamapp.errors import ExitCode, SeamMovedError, one_line
from streamapp.kafka import seams


async def _connect_elsewhere(self):  # the reader made by a helper: no StreamReader here to swap
    self._reader, self._writer = await self._open()


def _feed_data_without_pausing(self, data):  # the same name and parameters, other bookkeeping
    self._buffer.extend(data)
    self._wakeup_waiter()


def _send_changed(self, request, expect_response=True):
    return self._send_framed(request, expect_response)


def _write_header_changed(self, use_compression_type=True):
    self._write_header_v3(use_compression_type)


async def _fetch_request_changed(self, assignment, node_id, request):
    return self._decode_all(request)


def _create_consumer_with_client(self, loop, client_id):
    return None


async def _drain_changed(self, fetcher):
    await self._fetch_loop(fetcher)


async def _add_gap_as_range(self, tp, gap):
    return None


def _handler_changed(self):
    return self._handler_v2


async def _flush_changed(self):
    await self._flush_all()


def _task_done_without_count(self):  # as a Python that counts unfinished tasks elsewhere
    self._finished.set()


def _partition_with_headers(self, topic, partition, key, value, serialized_key, serialized_value, headers):
    return 0


def _flow_queue_init_changed(self, maxsize=0, *, flow_control, **kwargs):
    self._flow = flow_control


def _message_out_changed(self, tp, offset, message, state):
    return None


def _monitor_in_changed(self, tp, offset, stream, event, state):
    return None


def _observe_changed(self, amount, exemplar=None):
    self._observe_all(amount)


async def _on_start_changed(self):
    await self._start_recovery()


def _set_changed(self, key, value, partition):
    return None


async def _commit_changed(self, offsets, metadata):
    return True


# What a new release could do to what each seam depends on.
MOVES: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "read: responses read whole": lambda mp: mp.setattr(AIOKafkaConnection, "connect", _connect_elsewhere),
    "read: asyncio's StreamReader buffer":
        lambda mp: mp.setattr(asyncio.StreamReader, "feed_data", _feed_data_without_pausing),
    "write: produce requests unjoined": lambda mp: mp.setattr(AIOKafkaConnection, "send", _send_changed),
    "crc: batches built lean": lambda mp: mp.setattr(default_records._DefaultRecordBatchBuilderPy, "_write_header",
                                                     _write_header_changed),
    "crc: fetched batches checked": lambda mp: mp.setattr(aiokafka.consumer.fetcher.Fetcher, "_proc_fetch_request",
                                                          _fetch_request_changed),
    "consumer: fetch wait": lambda mp: mp.setattr(faust.transport.drivers.aiokafka.AIOKafkaConsumerThread,
                                                  "_create_consumer", _create_consumer_with_client),
    "consumer: fetch loop": lambda mp: mp.setattr(faust.transport.consumer.Consumer, "_drain_messages",
                                                  _drain_changed),
    "consumer: rebalance and gaps": lambda mp: mp.setattr(faust.transport.consumer.Consumer, "_add_gap",
                                                          _add_gap_as_range),
    "handover: records to streams directly": lambda mp: mp.setattr(
        faust.transport.conductor.Conductor, "_compile_message_handler", _handler_changed),
    "producer: flush and send buffer": lambda mp: mp.setattr(faust.transport.drivers.aiokafka.Producer, "flush",
                                                             _flush_changed),
    "buffers: asyncio's queue internals": lambda mp: mp.setattr(asyncio.Queue, "task_done", _task_done_without_count),
    "producer: aiokafka's producer": lambda mp: mp.setattr(AIOKafkaProducer, "_partition", _partition_with_headers),
    "producer: Faust's producer settings": lambda mp: mp.delattr(faust.transport.drivers.aiokafka.Producer,
                                                                 "_settings_auth"),
    "buffers: stream buffers in bytes": lambda mp: mp.setattr(mode.utils.queues.FlowControlQueue, "__init__",
                                                              _flow_queue_init_changed),
    "streams: sensors and acks per batch": lambda mp: mp.setattr(SensorDelegate, "on_message_out",
                                                                 _message_out_changed),
    "monitor: Faust's Prometheus sensor": lambda mp: mp.setattr(Monitor, "on_stream_event_in", _monitor_in_changed),
    "monitor: histogram observed at once": lambda mp: mp.setattr(prometheus_client.metrics.Histogram, "observe",
                                                                 _observe_changed),
    "app: transport and table manager": lambda mp: mp.setattr(faust.tables.manager.TableManager, "on_start",
                                                              _on_start_changed),
    "store: RocksDB store hooks": lambda mp: mp.setattr(faust.stores.rocksdb.Store, "_set", _set_changed),
    "transactions: one per input partition": lambda mp: mp.setattr(faust.transport.consumer.Consumer, "_commit",
                                                                    _commit_changed),
}


def test_every_seam_holds_on_the_pinned_versions():
    assert [(result.seam.name, result.moved) for result in seams.check() if result.moved] == []


def test_every_seam_has_a_test_that_moves_it():
    assert sorted(MOVES) == sorted(seam.name for seam in seams.SEAMS)
    assert {seam.package for seam in seams.SEAMS} == set(seams.PACKAGES)


@pytest.mark.parametrize("name", sorted(MOVES))
def test_a_moved_seam_refuses_in_one_line_naming_library_version_and_seam(name, monkeypatch):
    MOVES[name](monkeypatch)
    assert [result.seam.name for result in seams.check() if result.moved] == [name]
    with pytest.raises(SeamMovedError) as refused:
        seams.require_all()
    library = next(seam.package for seam in seams.SEAMS if seam.name == name)
    line = one_line(refused.value)
    assert str(refused.value) == line
    assert line.startswith(f"{library} {seams.installed_version(library)} moved under the seam {name!r}: ")
    assert refused.value.exit_code == ExitCode.SEAM_MOVED


REFUSING_WORKER = """
import sys
from aiokafka.conn import AIOKafkaConnection
def send(self, request, expect_response=True):
    return None
AIOKafkaConnection.send = send  # as a release that rewrote it would have it
from streamapp.worker.factory import create_app_or_exit
create_app_or_exit()
print("started")
"""


def test_a_worker_refuses_to_start_on_a_moved_seam(tmp_path):
    env = {**os.environ, "STREAMAPP_DATA_DIR": str(tmp_path / "data")}
    finished = subprocess.run([sys.executable, "-c", REFUSING_WORKER], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == ExitCode.SEAM_MOVED, finished.stderr
    assert "started" not in finished.stdout
    [line] = finished.stderr.strip().splitlines()
    # (a function made by -c has no source file: the check says so rather than hash it)
    assert line.startswith("streamapp: error: aiokafka 0.14.0 moved under the seam 'write: produce requests unjoined': "
                           "aiokafka.conn:AIOKafkaConnection.send has no source to check")
    assert not (tmp_path / "data").exists()  # refused before it made anything
