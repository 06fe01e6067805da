"""The command line: `ultra3` / `nemotron ultra3` (app), what a stage command and a pipe do once parsed, the
dry run's and the pipe plan's printing, and `nemotron jobs`. Everything below it is the core and the stages."""
