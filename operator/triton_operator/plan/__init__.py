"""The pure planner: what a reconcile decides (children to apply and delete, the status, the Events)."""
