//! corral's model pool: the registry of known models and, later, the lifecycle of one
//! engine child process per model. It never links model code.
