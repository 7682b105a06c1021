"""The bundle's entry point (`deploy/edgeserve.spec`): the same `main` as the `edgeserve` script."""

from edgeserve.cli import main

raise SystemExit(main())
