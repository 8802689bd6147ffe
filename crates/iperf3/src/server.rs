//! Serving stock iperf3 clients (not yet implemented).
