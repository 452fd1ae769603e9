"""`python -m nri_gpushare.cli`: the same as the `nri-gpushare` command."""

import sys

from nri_gpushare.cli.main import main

sys.exit(main())
