"""The protocol-agnostic capture machinery: pcap/pcapng reading, TCP reassembly, the dissector driver."""
