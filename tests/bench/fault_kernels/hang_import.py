"""A kernel module that never finishes importing: the runner must time its import out."""

import time

time.sleep(3600)
NAME = "hang_at_import"
