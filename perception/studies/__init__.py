"""The statistical studies' pure code (the scripts in studies/ are their command lines): the worlds they plant
and decide, and the summaries and tests they report, kept here so that the tests check them. The product never
imports this package (tests/test_layout.py)."""
