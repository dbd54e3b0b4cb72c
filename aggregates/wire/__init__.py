"""Wire formats used by the pipeline and the dispatcher: CloudEvents, the outbox entry
as an input envelope, the dispatcher's fence header. Pure.

docs/design.md "Layout of the library" says which room may import which."""
