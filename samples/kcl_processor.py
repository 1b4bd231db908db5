"""A KCL record processor written with amazon_kclpy's v3 interface, as a KCL user writes one.

It prints each record to stderr (stdout belongs to the daemon, which prefixes stderr lines
with the shard) and checkpoints at the end of each batch and at a shard's end. Run it under the mock daemon:

    wallaroo-proto kinesis mock-daemon --shards 2 --records 100 -- python samples/kcl_processor.py
"""

import sys

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor


class PrintingProcessor(processor.RecordProcessorBase):
    def initialize(self, initialize_input) -> None:
        print(f"starting after {initialize_input.sequence_number}", file=sys.stderr)

    def process_records(self, process_records_input) -> None:
        records = process_records_input.records
        for record in records:
            print(f"{record.partition_key}: {record.binary_data.decode(errors='replace')}", file=sys.stderr)
        if records:
            self.checkpoint(process_records_input.checkpointer, records[-1].sequence_number)

    def lease_lost(self, lease_lost_input) -> None:
        print("lease lost", file=sys.stderr)

    def shard_ended(self, shard_ended_input) -> None:
        self.checkpoint(shard_ended_input.checkpointer, None)  # the daemon waits for this one

    def shutdown_requested(self, shutdown_requested_input) -> None:
        self.checkpoint(shutdown_requested_input.checkpointer, None)

    def checkpoint(self, checkpointer, sequence_number) -> None:
        for _attempt in range(5):
            try:
                checkpointer.checkpoint(sequence_number)
                return
            except kcl.CheckpointError as err:
                print(f"checkpoint failed: {err.value}", file=sys.stderr)
                if err.value == "ShutdownException":
                    return


if __name__ == "__main__":
    kcl.KCLProcess(PrintingProcessor()).run()
