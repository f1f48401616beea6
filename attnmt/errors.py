"""The one exception type for errors a user can cause (bad config, missing file, bad corpus,
corrupt checkpoint). The command line prints its message as one line and exits non-zero."""


class UserError(Exception):
    """A problem in what the user gave us, explained in the message."""
