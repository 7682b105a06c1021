"""`python -m edgeserve` entry point."""

from edgeserve.cli import main

raise SystemExit(main())
