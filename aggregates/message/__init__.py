"""What flows: the message envelope (:class:`Message`, :class:`Source`), what handlers
emit (:class:`Emit`, references) and per-message outcomes. Pure.

docs/design.md "Layout of the library" says which room may import which."""
