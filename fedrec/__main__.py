"""`python -m fedrec` runs the command line."""

from fedrec.cli import main

main()
