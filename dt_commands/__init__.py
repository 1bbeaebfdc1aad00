"""Commands around the Pulumi program, never part of what it declares: the offline plan and its
mocks, the jobs CLI, which stacks a change touches, the pull request's job summary, the docs'
config reference and the acceptance check on a real subscription. ``infra``'s components never
import this package (ARCHITECTURE.md)."""
