#!/usr/bin/env bash
# Apache Kafka for the tests: a single-node KRaft broker (broker and controller in one
# process, plaintext, loopback only), run from the release's jars on Maven Central.
#
#   scripts/kafka.sh fetch DIR
#       Resolves org.apache.kafka:kafka_2.13 and its runtime dependencies, with the
#       log4j binding Kafka's own distribution ships, into DIR (quick once done).
#   scripts/kafka.sh start DIR WORKDIR PORT CONTROLLER_PORT [SECOND_PORT ADVERTISED]
#       Formats WORKDIR/data once and runs the broker in the foreground (the process is
#       the JVM: a test can SIGKILL it). It logs warnings to standard error. With
#       SECOND_PORT, a second listener there tells its clients the broker is at
#       ADVERTISED (a proxy in front of SECOND_PORT), so their every request goes
#       through that proxy.
#
# Transactions time out as on any Kafka (`transaction.timeout.ms`, checked every second
# here), and aborted records are hidden from read_committed consumers: the intake's
# faults that kill a replica inside a transaction run against this broker.
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"
LOG4J_VERSION=2.24.3
DEPENDENCY_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1

fetch() { # dir
	local dir="$1" stamp="kafka_2.13-$KAFKA_VERSION log4j-$LOG4J_VERSION"
	if [ "$(cat "$dir/.complete" 2>/dev/null)" = "$stamp" ]; then
		return 0
	fi
	mkdir -p "$dir"
	local pom
	pom="$(mktemp -d)"
	cat >"$pom/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.tests</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
POM
	rm -f "$dir"/*.jar
	if ! mvn -B -q -f "$pom/pom.xml" "$DEPENDENCY_PLUGIN:copy-dependencies" \
		-DincludeScope=runtime -DoutputDirectory="$dir" >"$pom/mvn.log" 2>&1; then
		cat "$pom/mvn.log" >&2
		rm -rf "$pom"
		echo "kafka.sh: cannot resolve kafka_2.13 $KAFKA_VERSION from Maven" >&2
		exit 1
	fi
	rm -rf "$pom"
	echo "$stamp" >"$dir/.complete"
}

start() { # jars workdir port controller_port [second_port advertised]
	local jars work port="$3" controller="$4"
	local listeners="PLAINTEXT://127.0.0.1:$port" advertised="PLAINTEXT://127.0.0.1:$port"
	local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
	if [ -n "${5:-}" ]; then
		listeners="$listeners,PROXIED://127.0.0.1:$5"
		advertised="$advertised,PROXIED://127.0.0.1:$6"
		protocols="$protocols,PROXIED:PLAINTEXT"
	fi
	jars="$(cd "$1" && pwd)"
	mkdir -p "$2"
	work="$(cd "$2" && pwd)"
	cat >"$work/log4j2.properties" <<LOG
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
LOG
	cat >"$work/server.properties" <<PROPERTIES
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
listeners=$listeners,CONTROLLER://127.0.0.1:$controller
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
log.dirs=$work/data
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
num.network.threads=2
num.io.threads=2
background.threads=2
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=2097152
PROPERTIES
	local jvm=(-Xms64m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss512k
		-Djava.awt.headless=true "-Dlog4j2.configurationFile=$work/log4j2.properties")
	if [ ! -f "$work/data/meta.properties" ]; then
		local cluster
		cluster="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
		java "${jvm[@]}" -cp "$jars/*" kafka.tools.StorageTool format -t "$cluster" \
			-c "$work/server.properties" --ignore-formatted >&2
	fi
	exec java "${jvm[@]}" -cp "$jars/*" kafka.Kafka "$work/server.properties"
}

case "${1:-}" in
fetch) fetch "$2" ;;
start) start "$2" "$3" "$4" "$5" "${6:-}" "${7:-}" ;;
*)
	echo "usage: $0 fetch DIR | start DIR WORKDIR PORT CONTROLLER_PORT" >&2
	exit 2
	;;
esac
