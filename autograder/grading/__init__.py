"""The trusted side of `camp grade`: read uploads, run each submission's cells in a sandbox,
run the course's tests here against stand-ins for the student's objects, keep the results."""
