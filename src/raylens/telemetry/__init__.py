"""What raylens measures: host memory per Ray node, and process-tree memory."""
