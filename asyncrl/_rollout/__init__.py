"""The rollout hot loop and what it steps: env pools, specs, policies, devices, recurrent state."""
