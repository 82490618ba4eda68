//! The bounded request parser and the reply encoder (to be written).
