"""The store writer and its collections (I/O): the writer and its passes, chunks and
conditional updates, dead letters, parked messages, and the writer's tracing spans.

docs/design.md "Layout of the library" says which room may import which."""
