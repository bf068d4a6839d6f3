"""rltune's developer tooling, outside the rltune package: the local test bed (`hack.bed`, run by
`python hack/testbed.py`) and `make demo` (`hack.demo`). Imported from the repository root
(`from hack.bed import pools`, `from hack import demo`); see docs/testbed.md."""
