pub mod ring_sys;
