"""Local servers for tests and for the embedded default: MongoDB and Kafka.

- :func:`start_local_mongodb` / :func:`mongodb_uri` — ``AGGBOX_MONGODB_URI``, else a
  ``mongod`` on PATH (one-node replica set), else mongo-java-server (see
  :mod:`aggbox.servers.mongo` for the environment variables and the stand-in's limits);
- :func:`local_mongodb_uri` / :func:`running_local_server` — the one server of
  ``aggbox local start`` that outlives commands (:mod:`aggbox.servers.persistent`);
  :func:`warn_throwaway_server` — the warning of a command about to start a throw-away one;
- :func:`start_local_kafka` / :func:`create_topic` — a real single-node KRaft broker from
  Maven Central jars (:mod:`aggbox.servers.kafka`);
- :func:`resolve_classpath` — Maven artifacts cached in ``$AGGBOX_CACHE_DIR``
  (:mod:`aggbox.servers.maven`).

Every failure is a :class:`ServerError` whose message says what to install or set.
"""

from aggbox.servers.errors import ServerError
from aggbox.servers.kafka import (
    KAFKA_VERSION,
    LocalKafka,
    create_topic,
    start_local_kafka,
    wait_for_kafka,
)
from aggbox.servers.maven import cache_dir, resolve_classpath
from aggbox.servers.mongo import (
    LocalMongo,
    MongoCapabilities,
    MongoKind,
    detect_capabilities,
    mongodb_uri,
    server_operation_time,
    shared_local_mongodb,
    start_local_mongodb,
)
from aggbox.servers.persistent import (
    LocalServerState,
    local_mongodb_uri,
    running_local_server,
    warn_throwaway_server,
)

__all__ = [
    "KAFKA_VERSION",
    "LocalKafka",
    "LocalMongo",
    "LocalServerState",
    "MongoCapabilities",
    "MongoKind",
    "ServerError",
    "cache_dir",
    "create_topic",
    "detect_capabilities",
    "local_mongodb_uri",
    "mongodb_uri",
    "resolve_classpath",
    "running_local_server",
    "server_operation_time",
    "shared_local_mongodb",
    "start_local_kafka",
    "start_local_mongodb",
    "wait_for_kafka",
    "warn_throwaway_server",
]
