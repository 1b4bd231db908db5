// Drives Couchbase's java-dcp-client, unmodified, against a KV port: streams every vbucket to
// "now" and prints one line per event, for the interop tests.
//
// Usage: java DcpDriver HOST:PORT BUCKET USER PASSWORD BUFFER_BYTES [OFFSETS_FILE]
// OFFSETS_FILE lines: "vbucket vbuuid seqno snapStart snapEnd until" to resume from (else: from the
// beginning to now); a resumed stream has no end, so it is done once an item or a rollback reaches "until".
// Output lines: "MUTATION vb seqno cas key", "DELETION vb seqno cas key expired(true|false)",
// "ROLLBACK vb seqno", "END vb reason", "FAILURE vb message", "OFFSET vb vbuuid seqno snapStart snapEnd",
// and "DONE n" once every vbucket's stream ended (with -Ddriver.endsOk=true: ended OK, as a stream the
// client reopens after another reason is not done).
import com.couchbase.client.dcp.Client;
import com.couchbase.client.dcp.StreamFrom;
import com.couchbase.client.dcp.StreamTo;
import com.couchbase.client.dcp.highlevel.DatabaseChangeListener;
import com.couchbase.client.dcp.highlevel.Deletion;
import com.couchbase.client.dcp.highlevel.FlowControlMode;
import com.couchbase.client.dcp.highlevel.Mutation;
import com.couchbase.client.dcp.highlevel.Rollback;
import com.couchbase.client.dcp.highlevel.SnapshotMarker;
import com.couchbase.client.dcp.highlevel.StreamEnd;
import com.couchbase.client.dcp.highlevel.StreamFailure;
import com.couchbase.client.dcp.highlevel.StreamOffset;
import com.couchbase.client.dcp.message.StreamEndReason;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

public class DcpDriver {
    static synchronized void out(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        Client client = Client.builder()
                .seedNodes(args[0])
                .bucket(args[1])
                .credentials(args[2], args[3])
                .flowControl(Integer.parseInt(args[4]))
                .bootstrapTimeout(Duration.ofSeconds(60))
                .build();
        Map<Integer, StreamOffset> last = new ConcurrentHashMap<>();
        Map<Integer, Long> until = new ConcurrentHashMap<>();
        Map<Integer, Long> reached = new ConcurrentHashMap<>();
        CountDownLatch[] done = new CountDownLatch[1];
        Runnable check = () -> {
            if (!until.isEmpty() && until.entrySet().stream().allMatch(e -> reached.getOrDefault(e.getKey(), -1L) >= e.getValue())) {
                while (done[0].getCount() > 0) {
                    done[0].countDown();
                }
            }
        };
        done[0] = new CountDownLatch(1);
        client.listener(new DatabaseChangeListener() {
            @Override
            public void onMutation(Mutation m) {
                out("MUTATION " + m.getVbucket() + " " + m.getOffset().getSeqno() + " " + m.getCas() + " " + m.getKey());
                last.put(m.getVbucket(), m.getOffset());
                reached.put(m.getVbucket(), m.getOffset().getSeqno());
                m.flowControlAck();
                check.run();
            }

            @Override
            public void onDeletion(Deletion d) {
                out("DELETION " + d.getVbucket() + " " + d.getOffset().getSeqno() + " " + d.getCas() + " " + d.getKey()
                        + " " + d.isDueToExpiration());
                last.put(d.getVbucket(), d.getOffset());
                reached.put(d.getVbucket(), d.getOffset().getSeqno());
                d.flowControlAck();
                check.run();
            }

            @Override
            public void onRollback(Rollback r) {
                out("ROLLBACK " + r.getVbucket() + " " + r.getSeqno());
                reached.put(r.getVbucket(), r.getSeqno());
                r.resume();
                check.run();
            }

            @Override
            public void onStreamEnd(StreamEnd e) {
                out("END " + e.getVbucket() + " " + e.getReason());
                if (!Boolean.getBoolean("driver.endsOk") || StreamEndReason.OK.equals(e.getReason())) {
                    done[0].countDown();
                }
            }

            @Override
            public void onFailure(StreamFailure f) {
                out("FAILURE " + f.getVbucket() + " " + f.getCause());
            }
        }, FlowControlMode.AUTOMATIC);
        client.connect().block();
        if (args.length > 5) {
            done[0] = new CountDownLatch(1);
            client.initializeState(StreamFrom.BEGINNING, StreamTo.NOW).block();
            Map<Integer, StreamOffset> offsets = new HashMap<>();
            for (String line : Files.readAllLines(Paths.get(args[5]))) {
                String[] f = line.trim().split(" ");
                if (f.length == 6) {
                    until.put(Integer.parseInt(f[0]), Long.parseLong(f[5]));
                    offsets.put(Integer.parseInt(f[0]), new StreamOffset(Long.parseLong(f[1]), Long.parseLong(f[2]),
                            new SnapshotMarker(Long.parseLong(f[3]), Long.parseLong(f[4])), 0));
                }
            }
            client.resumeStreaming(offsets).block();
            check.run();
        } else {
            done[0] = new CountDownLatch(client.numPartitions());
            client.initializeState(StreamFrom.BEGINNING, StreamTo.NOW).block();
            client.startStreaming().block();
        }
        boolean finished = done[0].await(Long.parseLong(System.getProperty("driver.timeout", "120")), TimeUnit.SECONDS);
        // The offsets the client itself keeps (what an application saves), for each vbucket that got items.
        for (Map.Entry<Integer, StreamOffset> e : last.entrySet()) {
            StreamOffset o = client.sessionState().get(e.getKey()).getOffset();
            out("OFFSET " + e.getKey() + " " + o.getVbuuid() + " " + o.getSeqno() + " " + o.getSnapshot().getStartSeqno()
                    + " " + o.getSnapshot().getEndSeqno());
        }
        out((finished ? "DONE " : "TIMEOUT ") + client.numPartitions());
        client.disconnect().block();
        System.exit(finished ? 0 : 3);
    }
}
