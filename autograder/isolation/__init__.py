"""Where a student's code runs during grading: a bubblewrap sandbox (`sandbox`: start, talk,
stop), the program that finishes setting it up from inside (`sandbox_init`: limited tmpfs, drop
to the sandbox uid), the one that runs the student's cells and answers the grader
(`student_process`), and the machine-wide pieces each sandbox gets: a system-call filter
(`seccomp`), a CPU/memory/task budget (`cgroups`) and an exclusively leased uid (`uids`)."""
