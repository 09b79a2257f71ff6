//! Parity tests against Python oracles (filled in below).
