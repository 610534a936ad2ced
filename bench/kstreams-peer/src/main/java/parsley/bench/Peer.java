package parsley.bench;

import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Duration;
import java.time.Instant;
import java.util.Arrays;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.internals.DefaultKafkaClientSupplier;
import org.apache.kafka.streams.state.KeyValueBytesStoreSupplier;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * Kafka Streams peer for the Parsley benchmark.
 *
 * Usage: peer BOOTSTRAP INPUT OUTPUT WORK STORE COMMIT_MS APP_ID STATE_DIR TIMING_FILE
 *
 * Prints RUNNING once the client first runs, closes at end of stdin, then
 * prints CLOSED and exits 0. Exits 1 if Kafka Streams fails.
 */
public final class Peer {
    private static final int D = 0, CS = 1, CT = 2, CE = 3;

    /** Timing lines kept in memory as (kind, a, b) triples until close. */
    static final class Timing {
        private long[] buf = new long[3 * 16384];
        private int len;

        synchronized void add(long kind, long a, long b) {
            if (len + 3 > buf.length) {
                buf = Arrays.copyOf(buf, buf.length * 2);
            }
            buf[len++] = kind;
            buf[len++] = a;
            buf[len++] = b;
        }

        synchronized void write(String path) throws IOException {
            try (BufferedWriter w = Files.newBufferedWriter(Paths.get(path), StandardCharsets.US_ASCII)) {
                for (int i = 0; i < len; i += 3) {
                    if (buf[i] == D) {
                        w.write("d " + buf[i + 1] + " " + buf[i + 2] + "\n");
                    } else {
                        String mark = buf[i] == CS ? "cs " : buf[i] == CT ? "ct " : "ce ";
                        w.write(mark + buf[i + 1] + "\n");
                    }
                }
            }
        }
    }

    /** Null when no timing file was asked for. */
    static Timing timing;

    static long micros() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000L + now.getNano() / 1000;
    }

    /** Copy: forwards each record as it is, after noting the time. */
    static final class Copy implements Processor<byte[], byte[], byte[], byte[]> {
        private ProcessorContext<byte[], byte[]> ctx;

        @Override
        public void init(ProcessorContext<byte[], byte[]> ctx) {
            this.ctx = ctx;
        }

        @Override
        public void process(Record<byte[], byte[]> r) {
            if (timing != null) {
                long t = micros();
                String v = new String(r.value(), StandardCharsets.US_ASCII);
                timing.add(D, Long.parseLong(v.substring(20)), t);
            }
            ctx.forward(r);
        }
    }

    /** Sum: adds the record's number to its key's total, and sends the new total. */
    static final class Sum implements Processor<byte[], String, byte[], String> {
        private ProcessorContext<byte[], String> ctx;
        private KeyValueStore<String, Long> sums;

        @Override
        public void init(ProcessorContext<byte[], String> ctx) {
            this.ctx = ctx;
            this.sums = ctx.getStateStore("sums");
        }

        @Override
        public void process(Record<byte[], String> r) {
            long t = timing != null ? micros() : 0;
            String v = r.value();
            if (timing != null) {
                timing.add(D, Long.parseLong(v.substring(20)), t);
            }
            String key = r.key() == null ? "" : new String(r.key(), StandardCharsets.UTF_8);
            long n = Long.parseLong(v.substring(52));
            Long old = sums.get(key);
            long sum = (old == null ? 0 : old) + n;
            sums.put(key, sum);
            ctx.forward(r.withValue(v.substring(0, 20) + pad44(sum)));
        }
    }

    /** The decimal form of a non-negative n, zero-padded to 44 digits. */
    static String pad44(long n) {
        String s = Long.toString(n);
        char[] out = new char[44];
        int z = 44 - s.length();
        Arrays.fill(out, 0, z, '0');
        s.getChars(0, s.length(), out, z);
        return new String(out);
    }

    /** The default clients, with the producer wrapped to time its commits. */
    static final class Supplier extends DefaultKafkaClientSupplier {
        @Override
        @SuppressWarnings("unchecked")
        public Producer<byte[], byte[]> getProducer(Map<String, Object> config) {
            Producer<byte[], byte[]> inner = super.getProducer(config);
            if (timing == null) {
                return inner;
            }
            return (Producer<byte[], byte[]>) Proxy.newProxyInstance(
                Producer.class.getClassLoader(), new Class<?>[] {Producer.class},
                (proxy, method, args) -> {
                    // A commit starts with the offsets (cs), then asks
                    // for the commit (ct), and ends when that returns (ce).
                    if (method.getName().equals("sendOffsetsToTransaction")) {
                        timing.add(CS, micros(), 0);
                    }
                    boolean commit = method.getName().equals("commitTransaction");
                    if (commit) {
                        timing.add(CT, micros(), 0);
                    }
                    try {
                        return method.invoke(inner, args);
                    } catch (InvocationTargetException e) {
                        throw e.getCause();
                    } finally {
                        if (commit) {
                            timing.add(CE, micros(), 0);
                        }
                    }
                });
        }
    }

    private static void usage(String why) {
        System.err.println("peer: " + why);
        System.err.println("usage: peer BOOTSTRAP INPUT OUTPUT WORK STORE COMMIT_MS APP_ID STATE_DIR TIMING_FILE");
        System.err.println("  WORK: copy|sum  STORE: memory|rocksdb  TIMING_FILE: a path or -");
        System.exit(2);
    }

    public static void main(String[] args) throws Exception {
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        if (args.length != 9) {
            usage("expected 9 arguments, got " + args.length);
        }
        String bootstrap = args[0], input = args[1], output = args[2], work = args[3], store = args[4];
        String appId = args[6], stateDir = args[7], timingFile = args[8];
        long commitMs = 0;
        try {
            commitMs = Long.parseLong(args[5]);
        } catch (NumberFormatException e) {
            usage("COMMIT_MS is not a number: " + args[5]);
        }
        if (!work.equals("copy") && !work.equals("sum")) {
            usage("WORK must be copy or sum, not " + work);
        }
        if (!store.equals("memory") && !store.equals("rocksdb")) {
            usage("STORE must be memory or rocksdb, not " + store);
        }
        if (!timingFile.equals("-")) {
            timing = new Timing();
        }

        Topology topo = new Topology();
        if (work.equals("copy")) {
            topo.addSource("in", new ByteArrayDeserializer(), new ByteArrayDeserializer(), input);
            topo.addProcessor("work", Copy::new, "in");
            topo.addSink("out", output, new ByteArraySerializer(), new ByteArraySerializer(), "work");
        } else {
            KeyValueBytesStoreSupplier kv = store.equals("memory")
                ? Stores.inMemoryKeyValueStore("sums")
                : Stores.persistentKeyValueStore("sums");
            topo.addSource("in", new ByteArrayDeserializer(), new StringDeserializer(), input);
            topo.addProcessor("work", Sum::new, "in");
            topo.addStateStore(Stores.keyValueStoreBuilder(kv, Serdes.String(), Serdes.Long()), "work");
            topo.addSink("out", output, new ByteArraySerializer(), new StringSerializer(), "work");
        }

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.CLIENT_ID_CONFIG, "ks");
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, commitMs);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0L);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);

        // The main thread waits here for either end of stdin or a failure.
        LinkedBlockingQueue<Object> events = new LinkedBlockingQueue<>();
        final Object eof = new Object();
        AtomicBoolean announced = new AtomicBoolean();

        KafkaStreams streams = new KafkaStreams(topo, p, new Supplier());
        streams.setUncaughtExceptionHandler(e -> {
            events.add(e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING && announced.compareAndSet(false, true)) {
                synchronized (System.out) {
                    System.out.println("RUNNING");
                    System.out.flush();
                }
            } else if (now == KafkaStreams.State.ERROR) {
                events.add("Kafka Streams went from " + before + " to ERROR");
            }
        });

        Thread stdin = new Thread(() -> {
            byte[] b = new byte[4096];
            try (InputStream in = System.in) {
                while (in.read(b) >= 0) {
                    // Anything written to stdin is ignored; only its end matters.
                }
            } catch (IOException e) {
                // Treat a broken stdin as its end.
            }
            events.add(eof);
        }, "peer-stdin");
        stdin.setDaemon(true);

        streams.start();
        stdin.start();

        Object ev = events.take();
        if (ev != eof) {
            System.err.println("peer: Kafka Streams failed:");
            if (ev instanceof Throwable) {
                ((Throwable) ev).printStackTrace();
            } else {
                System.err.println("peer: " + ev);
            }
            streams.close(Duration.ofSeconds(30));
            System.exit(1);
        }

        if (!streams.close(Duration.ofSeconds(30))) {
            System.err.println("peer: Kafka Streams did not close within 30 s");
        }
        if (timing != null) {
            timing.write(timingFile);
        }
        synchronized (System.out) {
            System.out.println("CLOSED");
            System.out.flush();
        }
        System.exit(0);
    }
}
