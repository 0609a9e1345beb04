package streamapp.bench;

import java.io.IOException;
import java.io.Reader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;

/**
 * A KStream-KStream inner join of frames with their inference results, keyed per frame
 * ("stream:epoch:index"), one stream thread. Each output value is the frame record followed by the
 * result record. Prints "STATE <state>" on every state change (the bench waits for RUNNING), and
 * "ROCKSDB_BYTES <n>" every second: the memtables and SST files of its window stores, from the
 * client's RocksDB metrics. Exits 1 if the client fails.
 *
 * Arguments: bootstrap application-id frames-topic results-topic output-topic state-dir window-ms
 * client-properties (a file of the connection's security settings: security.protocol, ssl.*, sasl.*)
 */
public final class KStreamsJoin {

    public static void main(String[] args) throws InterruptedException, IOException {
        if (args.length != 8) {
            System.err.println("usage: KStreamsJoin BOOTSTRAP APP_ID FRAMES RESULTS OUTPUT STATE_DIR WINDOW_MS CLIENT_PROPERTIES");
            System.exit(2);
        }
        Serde<byte[]> bytes = Serdes.ByteArray();
        StreamsBuilder builder = new StreamsBuilder();
        KStream<byte[], byte[]> frames = builder.stream(args[2], Consumed.with(bytes, bytes));
        KStream<byte[], byte[]> results = builder.stream(args[3], Consumed.with(bytes, bytes));
        JoinWindows window = JoinWindows.ofTimeDifferenceWithNoGrace(Duration.ofMillis(Long.parseLong(args[6])));
        frames.join(results, KStreamsJoin::concatenate, window, StreamJoined.with(bytes, bytes, bytes).withStoreName("frames-results"))
              .to(args[4], Produced.with(bytes, bytes));

        KafkaStreams streams = new KafkaStreams(builder.build(), config(args[0], args[1], args[5], args[7]));
        CountDownLatch stopped = new CountDownLatch(1);
        boolean[] failed = {false};
        streams.setStateListener((now, before) -> {
            System.out.println("STATE " + now);
            System.out.flush();
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                failed[0] |= now == KafkaStreams.State.ERROR;
                stopped.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(error -> {
            error.printStackTrace();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(10))));
        ScheduledExecutorService reporter = Executors.newSingleThreadScheduledExecutor(task -> {
            Thread thread = new Thread(task, "rocksdb-bytes");
            thread.setDaemon(true);
            return thread;
        });
        reporter.scheduleAtFixedRate(() -> System.out.println("ROCKSDB_BYTES " + rocksdbBytes(streams)),
                                     1, 1, TimeUnit.SECONDS);
        streams.start();
        stopped.await();
        System.exit(failed[0] ? 1 : 0);
    }

    /** What a user would set: one thread, state in the bench's directory, batched output. */
    static Properties config(String bootstrap, String applicationId, String stateDir, String clientProperties)
            throws IOException {
        Properties props = new Properties();
        try (Reader reader = Files.newBufferedReader(Path.of(clientProperties))) {
            props.load(reader);
        }
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // Records are ~50 KB frames: the default 16 KiB batch holds none, so each would be its own batch.
        props.put(StreamsConfig.producerPrefix(ProducerConfig.BATCH_SIZE_CONFIG), 1024 * 1024);
        props.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), 5);
        props.put(StreamsConfig.producerPrefix(ProducerConfig.MAX_REQUEST_SIZE_CONFIG), 17 * 1024 * 1024);
        return props;
    }

    /** Bytes the join's state holds in RocksDB: every store's memtables plus its SST files. */
    static long rocksdbBytes(KafkaStreams streams) {
        long total = 0;
        for (Metric metric : streams.metrics().values()) {
            String name = metric.metricName().name();
            boolean size = name.equals("size-all-mem-tables") || name.equals("total-sst-files-size");
            if (size && metric.metricValue() instanceof Number value) {
                total += value.longValue();
            }
        }
        return total;
    }

    static byte[] concatenate(byte[] frame, byte[] result) {
        byte[] joined = new byte[frame.length + result.length];
        System.arraycopy(frame, 0, joined, 0, frame.length);
        System.arraycopy(result, 0, joined, frame.length, result.length);
        return joined;
    }
}
