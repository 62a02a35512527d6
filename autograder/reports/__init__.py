"""What people read after grading: feedback per student, the class report, the gradebook."""
