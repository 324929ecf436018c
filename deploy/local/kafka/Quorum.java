// What `kafka-metadata-quorum describe --status --replication` reports, from the kafka-clients
// jar alone (the kafka-tools jar is not among the ones we fetch): the KRaft quorum's leader,
// its epoch and every voter's replication state, as one JSON line.
//
// Usage: java -cp "libs/*:tools" Quorum CONTROLLER_HOST:PORT[,...]
// Exit 1 (with the reason on stderr) when no controller answers within 10 s.
import java.util.Properties;
import java.util.StringJoiner;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.QuorumInfo;

public final class Quorum {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        // Straight to the controllers (KIP-919): the answer does not need a live broker.
        props.put(AdminClientConfig.BOOTSTRAP_CONTROLLERS_CONFIG, args[0]);
        // Bounded so a caller polling a quorum that has no leader yet gets an answer quickly.
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "5000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "10000");
        try (Admin admin = Admin.create(props)) {
            QuorumInfo q = admin.describeMetadataQuorum().quorumInfo().get(10, TimeUnit.SECONDS);
            StringJoiner voters = new StringJoiner(",", "[", "]");
            for (QuorumInfo.ReplicaState v : q.voters()) {
                voters.add(String.format(
                    "{\"id\":%d,\"log_end_offset\":%d,\"last_fetch_ms\":%d,\"last_caught_up_ms\":%d}",
                    v.replicaId(), v.logEndOffset(), v.lastFetchTimestamp().orElse(-1L),
                    v.lastCaughtUpTimestamp().orElse(-1L)));
            }
            StringJoiner observers = new StringJoiner(",", "[", "]");
            for (QuorumInfo.ReplicaState o : q.observers()) {
                observers.add(Integer.toString(o.replicaId()));
            }
            System.out.printf("{\"leader\":%d,\"epoch\":%d,\"high_watermark\":%d,\"voters\":%s,\"observers\":%s}%n",
                q.leaderId(), q.leaderEpoch(), q.highWatermark(), voters, observers);
        } catch (Exception e) {
            System.err.println("quorum not described: " + e);
            System.exit(1);
        }
    }
}
