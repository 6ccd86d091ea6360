#!/usr/bin/env bash
# Fetches the Apache Kafka broker the integration tests run (needs Java 17 and Maven)
# into a cache outside the clone, once. Prints the folder of jars.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/kafka/pom.xml")"
dest="${WEIBO_KAFKA_JARS:-$HOME/.cache/weibo/kafka-$version}"
if [ ! -f "$dest/.complete" ]; then
  command -v java >/dev/null || { echo "Java 17 is needed to run the test Kafka broker (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
  command -v mvn >/dev/null || { echo "Maven is needed to fetch the test Kafka broker (apt-get install maven)" >&2; exit 1; }
  mkdir -p "$dest"
  mvn -q -f "$here/kafka/pom.xml" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$dest" >&2
  touch "$dest/.complete"
fi
echo "$dest"
