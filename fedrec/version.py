"""fedrec's version: `fedrec.__version__` and every results file's ``fedrec_version`` (the
package metadata in pyproject.toml says the same)."""

__version__ = "0.1.0"
