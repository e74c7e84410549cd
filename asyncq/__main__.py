import sys

from asyncq.cli import main

sys.exit(main())
