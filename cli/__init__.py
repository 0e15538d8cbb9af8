"""The `cedar` command (`cli.main`): the command line of the pipeline. It validates and switches params, builds the
smoke inputs, lists and explains runs through the library, and offers the flow's commands (`flow.commands`)."""
