"""A local Apache Kafka broker, or a three-node cluster, for development, tests and CI.

The broker is the real thing: ``kafka.Kafka`` from the Apache Kafka jars published on Maven
Central, in KRaft mode (each process is both broker and controller; no ZooKeeper). Nothing else
has to be installed besides Java 17+ and, for the first run only, Maven:

* :func:`ensure_jars` copies the jars listed in ``streamapp/tools/localkafka/kafka/pom.xml`` into
  ``$STREAMAPP_KAFKA_HOME/libs`` (default ``~/.cache/streamapp/kafka-<version>/libs``) with
  ``mvn dependency:copy-dependencies``, once; a marker file written after a complete copy makes
  later runs reuse it.
* :class:`LocalBroker` keeps everything of one broker in its data directory: ``server.properties``,
  ``broker.pid``, ``broker.log`` (the broker's stdout/stderr; the previous run's is kept as
  ``broker.log.1``), ``cluster.id`` and the Kafka log directory ``logs/``.

``LocalBroker(data_dir, port).start()`` returns once the broker answers a metadata request;
``stop()`` sends SIGTERM and waits, killing the broker only when it does not exit in time.
:class:`LocalCluster` runs three such nodes from one directory (``node-1`` ... ``node-3``) as one
KRaft quorum, every topic replicated on all three and ``min.insync.replicas`` 2, so one node can
be killed without stopping or losing anything.
Every expected failure raises :class:`BrokerError` with a message that says what to do.
"""
