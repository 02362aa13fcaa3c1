//! ipkeep's end-to-end test infrastructure.
