//! corral's gateway: the public HTTP server a person leaves running. It never tokenizes
//! and never links model code; it routes by model id and forwards bytes to engines.
