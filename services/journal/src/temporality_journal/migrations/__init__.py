"""The read model's schema migrations (Alembic): ``env.py`` and ``versions/``, applied at start by
:meth:`temporality_journal.Database.migrate` (see docs/journal.md, "Schema and rebuild")."""
