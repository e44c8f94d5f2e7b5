"""The course lab kit: handouts, reference solutions, generated starter code and autograders (see README.md)."""
