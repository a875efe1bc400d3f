"""Training data as a contract between `lmspec data prepare`, the compiler's checks and the runtime."""
