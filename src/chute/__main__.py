"""``python -m chute``: the same as the ``chute`` command."""

from chute.cli import main

raise SystemExit(main())
