"""Where a student's code runs during grading: a sandboxed process (`sandbox`), the program
that sets the sandbox up from inside (`sandbox_init`) and the one that runs the student's cells
and answers the grader (`student_process`)."""
