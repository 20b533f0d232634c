import sys

from kernaudit_pipeline.cli import main

sys.exit(main())
