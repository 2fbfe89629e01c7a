"""tghost benchmarks: each prints a table and writes JSON to bench/results/ (``tox -e bench``)."""
