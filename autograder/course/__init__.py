"""Authoring a lab: release it (`release`), run it with papermill (`execute`), read its source
notebook (`labspec`), make reference submissions (`reference`), a student's self-check
(`selfcheck`) and the nbgrader configuration they share (`nbgrader_setup`)."""
