"""What every room of the dispatcher may use: settings (section ``[dispatcher]``), fatal and
unreachable store errors, the injected clock (sleep, jitter) and the crash-test fault
points. Imports no other room.

docs/design.md "Layout of the dispatcher" says which room may import which."""
