"""``python -m attnmt`` (and ``torchrun -m attnmt``) runs the command line."""

from attnmt.cli import main

raise SystemExit(main())
