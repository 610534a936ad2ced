# Shared by scripts/kafka/broker and scripts/kafka/cluster: fetching Kafka
# from Maven Central into a cache, free loopback ports, node configuration
# and start-up. Sourced, not run.

kafka_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kafka_version="${PARSLEY_KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$kafka_here/pom.xml")}"
# The cache is keyed by the pom's contents as well as the version, so a
# dependency added to the pom (a logging binding, the admin tools) is
# fetched on machines that cached an older set.
kafka_pom_hash="$(sha256sum "$kafka_here/pom.xml" | cut -c1-8)"
kafka_cache="${PARSLEY_KAFKA_CACHE:-$HOME/.cache/parsley/kafka-$kafka_version-$kafka_pom_hash}"

log() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }

kafka_fetch() {
    if [[ -f "$kafka_cache/lib/.complete" ]]; then
        return
    fi
    command -v java >/dev/null || { log "java is not installed"; exit 1; }
    command -v mvn >/dev/null || { log "mvn is not installed"; exit 1; }
    log "fetching Apache Kafka $kafka_version from Maven Central into $kafka_cache"
    mkdir -p "$kafka_cache/lib"
    if ! mvn -q -B -Dstyle.color=never -f "$kafka_here/pom.xml" \
        -Dkafka.version="$kafka_version" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$kafka_cache/lib" >"$kafka_cache/fetch.log" 2>&1; then
        log "Maven could not fetch Kafka $kafka_version (is Maven Central reachable?):"
        tail -20 "$kafka_cache/fetch.log" >&2
        exit 1
    fi
    touch "$kafka_cache/lib/.complete"
}

kafka_classpath() {
    echo "$kafka_cache/lib/*"
}

port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Prints a port p with p and p+1 free, below the kernel's range of
# ephemeral ports: a client that keeps reconnecting to a stopped broker's
# port in that range can be given the port itself as its own local port
# (a TCP self-connect), and the broker then cannot bind it again.
free_port_pair() {
    local p low=32768
    if [[ -r /proc/sys/net/ipv4/ip_local_port_range ]]; then
        read -r low _ < /proc/sys/net/ipv4/ip_local_port_range
    fi
    local lowest=10000 span
    span=$(( low - 2 - lowest ))
    (( span > 1000 )) || { lowest=1024; span=$(( low - 2 - lowest )); }
    for _ in $(seq 1 200); do
        p=$(( lowest + (RANDOM * 32768 + RANDOM) % span ))
        if port_free "$p" && port_free "$((p + 1))"; then
            echo "$p"
            return
        fi
    done
    log "no free loopback port found"
    return 1
}

# Writes a log4j2 configuration that sends the broker's log to $2 (the
# Maven artifacts carry no configuration of their own).
kafka_log_config() {
    local file="$1" out="$2"
    cat > "$file" <<PROPS
appender.f.type = File
appender.f.name = F
appender.f.fileName = $out
appender.f.layout.type = PatternLayout
appender.f.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.f.ref = F
logger.state.name = state.change.logger
logger.state.level = WARN
PROPS
    # Kafka before 4.0 logs through log4j 1 (reload4j) and reads this one.
    cat > "$(dirname "$file")/log4j.properties" <<PROPS
log4j.rootLogger=INFO, f
log4j.appender.f=org.apache.log4j.FileAppender
log4j.appender.f.File=$out
log4j.appender.f.layout=org.apache.log4j.PatternLayout
log4j.appender.f.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.state.change.logger=WARN
PROPS
}

# Formats a node's log directory with a cluster id: kafka_format DIR ID.
# PARSLEY_KAFKA_FEATURES (space-separated name=level) sets feature levels
# at format time, for a cluster shaped like an upgraded one
# (group.version=0: no consumer group protocol, whatever the settings say).
kafka_format() {
    local dir="$1" cluster_id="$2" features=() f
    for f in ${PARSLEY_KAFKA_FEATURES:-}; do
        features+=(--feature "$f")
    done
    java -cp "$(kafka_classpath)" kafka.tools.StorageTool format -t "$cluster_id" \
        -c "$dir/server.properties" ${features[@]+"${features[@]}"} >"$dir/format.log" 2>&1 \
        || { log "formatting $dir failed:"; cat "$dir/format.log" >&2; exit 1; }
}

kafka_cluster_id() {
    java -cp "$(kafka_classpath)" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1
}

# Starts the node whose files are in DIR (server.properties, log4j2
# configuration) in the background and records its pid: kafka_launch DIR HEAP.
kafka_launch() {
    local dir="$1" heap="$2"
    nohup java "-Xms$heap" "-Xmx$heap" -XX:+UseSerialGC \
        -Dlog4j2.configurationFile="$dir/log4j2.properties" \
        -Dlog4j.configuration="file:$dir/log4j.properties" \
        -cp "$(kafka_classpath)" kafka.Kafka "$dir/server.properties" \
        >>"$dir/stdout.log" 2>&1 &
    echo $! > "$dir/pid"
}

# Whether the process recorded in DIR/pid is alive (a zombie, killed and
# not yet reaped, is not).
pid_running() {
    [[ -f "$1/pid" ]] || return 1
    local pid
    pid="$(cat "$1/pid")"
    kill -0 "$pid" 2>/dev/null || return 1
    ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}

# Waits until the node in DIR accepts connections on PORT (or exits).
kafka_await_port() {
    local dir="$1" port="$2"
    for _ in $(seq 1 240); do
        if ! pid_running "$dir"; then
            log "the broker in $dir exited during startup:"
            tail -30 "$dir/stdout.log" >&2 || true
            tail -30 "$dir/broker.log" >&2 || true
            return 1
        fi
        if ! port_free "$port"; then
            return 0
        fi
        sleep 0.5
    done
    log "the broker in $dir did not open port $port within 120 s"
    return 1
}

# Stops the process of DIR: SIGTERM, then SIGKILL after 30 s.
kafka_terminate() {
    local dir="$1"
    if pid_running "$dir"; then
        local pid
        pid="$(cat "$dir/pid")"
        # A paused process cannot act on SIGTERM.
        kill -CONT "$pid" 2>/dev/null || true
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 60); do
            pid_running "$dir" || break
            sleep 0.5
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
}
