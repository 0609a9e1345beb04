"""The producer's partitioner: Kafka's default partition for every key, its memo bounded in bytes."""

from aiokafka.partitioner import DefaultPartitioner

from streamapp.kafka.producer import KeyPartitioner

PARTITIONS = [0, 1, 2, 3]


def test_every_key_goes_where_kafkas_default_partitioner_puts_it_remembered_or_not():
    partitioner = KeyPartitioner()
    keys = [f"camera-{n}/1700000000/{n * 7}".encode() for n in range(200)]
    for key in keys + keys:
        assert partitioner(key, PARTITIONS, PARTITIONS) == DefaultPartitioner()(key, PARTITIONS, PARTITIONS)
    assert partitioner(keys[0], [0, 1, 2], [0, 1, 2]) == DefaultPartitioner()(keys[0], [0, 1, 2], [0, 1, 2])


def test_the_memo_stays_within_its_bytes_and_counts_each_time_it_forgets():
    partitioner = KeyPartitioner(max_bytes=1000)
    for n in range(100):
        partitioner(f"key-{n}".encode(), PARTITIONS, PARTITIONS)
        assert partitioner.as_metrics()["producer_key_hash_memo_bytes"] <= 1000
    assert partitioner.as_metrics()["producer_key_hash_memo_resets_total"] >= 100 * 120 // 1000 - 1


def test_no_key_is_spread_over_the_available_partitions():
    partitioner = KeyPartitioner()
    assert {partitioner(None, PARTITIONS, [2]) for _ in range(20)} == {2}
    assert partitioner.as_metrics()["producer_key_hash_memo_bytes"] == 0
