"""`python -m services.cli` is the `visior` command."""

import sys

from services.cli.main import main

sys.exit(main())
