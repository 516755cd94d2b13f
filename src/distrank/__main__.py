"""``python -m distrank``: the command line (see ``distrank.cli``)."""

from distrank.cli import main

raise SystemExit(main())
