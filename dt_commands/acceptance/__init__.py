"""``python -m dt_commands.acceptance --profile cpu|gpu`` (``make azure-check``): prove the stack
on a real subscription with a throwaway stack; ``--dry-run`` says what it would do, offline
(docs/acceptance.md). Modules: profiles and checks in order, options, host (this machine), plan
(the dry run), run (the Automation API steps), checks, cost; every Azure and Pulumi call goes
through an object passed in, so tests drive the whole sequence with fakes."""
