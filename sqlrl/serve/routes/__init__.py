"""The HTTP routes, one module per group: native (/generate and the info routes), openai
(/v1/chat/completions) and playground (the page, /execute, /feedback). Each depends on the
service and the plumbing (sqlrl.serve.http), never the reverse."""
